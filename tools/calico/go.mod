// Build glue only: pins Calico's CNI plugin, whose binary is also its IPAM plugin (calico-ipam,
// run with the Kubernetes datastore), that the benchmark runs as a peer. No code of allot's lives
// here. Calico's release tags (v3.x) are not valid versions of its module path, so the release is
// pinned by the pseudo-version of its tagged commit: v3.31.0 is calico b1f3c43f8437 (its charts
// say v3.31.0) with, from the separate api repository, api f2ab03771208. Calico's go.mod
// replaces its api and lib/std modules with directories of its repository (which its module zip
// leaves out), and the Kubernetes modules with one release; a dependency's replace directives
// are ignored, so each is repeated here. The checksum database has no record of these
// pseudo-versions: go.sum, written once with GONOSUMDB=github.com/projectcalico, is their pin.
module allot.dev/tools/calico

go 1.24.9

require (
	github.com/projectcalico/api v0.0.0-20251022175904-f2ab03771208
	github.com/projectcalico/calico v0.0.0-20251021213802-b1f3c43f8437
)

replace (
	github.com/projectcalico/calico/lib/std => github.com/projectcalico/calico/lib/std v0.0.0-20251021213802-b1f3c43f8437
	gopkg.in/natefinch/lumberjack.v2 => gopkg.in/natefinch/lumberjack.v2 v2.0.0
	k8s.io/api => k8s.io/api v0.33.5
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.33.5
	k8s.io/apimachinery => k8s.io/apimachinery v0.33.5
	k8s.io/apiserver => k8s.io/apiserver v0.33.5
	k8s.io/cli-runtime => k8s.io/cli-runtime v0.33.5
	k8s.io/client-go => k8s.io/client-go v0.33.5
	k8s.io/cloud-provider => k8s.io/cloud-provider v0.33.5
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.33.5
	k8s.io/code-generator => k8s.io/code-generator v0.33.5
	k8s.io/component-base => k8s.io/component-base v0.33.5
	k8s.io/component-helpers => k8s.io/component-helpers v0.33.5
	k8s.io/controller-manager => k8s.io/controller-manager v0.33.5
	k8s.io/cri-api => k8s.io/cri-api v0.33.5
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.33.5
	k8s.io/endpointslice => k8s.io/endpointslice v0.33.5
	k8s.io/externaljwt => k8s.io/externaljwt v0.33.5
	k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.33.5
	k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.33.5
	k8s.io/kube-proxy => k8s.io/kube-proxy v0.33.5
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.33.5
	k8s.io/kubectl => k8s.io/kubectl v0.33.5
	k8s.io/kubelet => k8s.io/kubelet v0.33.5
	k8s.io/metrics => k8s.io/metrics v0.33.5
	k8s.io/mount-utils => k8s.io/mount-utils v0.33.5
	k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.33.5
	k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.33.5
)
