// Build glue only: pins the Whereabouts IPAM (its CNI plugin and its ip-control-loop, which
// releases the addresses of deleted pods and runs the IP reconciler on a cron schedule) that the
// benchmark runs as a peer. No code of allot's lives here. Whereabouts' own go.mod replaces
// github.com/gogo/protobuf; a dependency's replace directives are ignored, so it is repeated here.
module allot.dev/tools/whereabouts

go 1.24

require github.com/k8snetworkplumbingwg/whereabouts v0.9.2

replace github.com/gogo/protobuf => github.com/gogo/protobuf v1.3.2
