//! The webhook's flags as the controller's command line takes them (`WebhookArgs` flattened).

use std::net::SocketAddr;
use std::time::Duration;

use allot_controller::webhook::WebhookArgs;
use clap::Parser;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    webhook: WebhookArgs,
}

#[test]
fn defaults_name_the_service_secret_and_configurations_of_the_chart() {
    let args = Cli::try_parse_from(["allot-controller"]).unwrap().webhook;
    let s = args.settings("allot-system");
    // IPv6 and IPv4 alike: an IPv6-only cluster's API server reaches it too.
    assert_eq!(s.bind, "[::]:9443".parse::<SocketAddr>().unwrap());
    assert_eq!(
        (
            s.service.as_str(),
            s.service_port,
            s.secret.as_str(),
            s.config_name.as_str()
        ),
        ("allot-webhook", 443, "allot-webhook-tls", "allot")
    );
    assert_eq!(s.namespace, "allot-system");
    assert_eq!(s.check_every, Duration::from_secs(60));
}

#[test]
fn every_flag_is_taken_and_a_bad_value_is_refused() {
    let args = Cli::try_parse_from([
        "allot-controller",
        "--webhook-port=8443",
        "--webhook-address=0.0.0.0",
        "--webhook-service=admission",
        "--webhook-service-port=8443",
        "--webhook-secret=admission-tls",
        "--webhook-config-name=allot-admission",
        "--webhook-check-seconds=30",
    ])
    .unwrap()
    .webhook;
    let s = args.settings("ns");
    assert_eq!(s.bind, "0.0.0.0:8443".parse::<SocketAddr>().unwrap());
    assert_eq!(s.target().service, "admission");
    assert_eq!(s.target().port, 8443);
    assert_eq!(s.secret, "admission-tls");
    assert_eq!(s.target().config_name, "allot-admission");
    assert_eq!(s.check_every, Duration::from_secs(30));
    for bad in [
        "--webhook-port=70000",
        "--webhook-check-seconds=0",
        "--webhook-address=localhost",
    ] {
        let e = Cli::try_parse_from(["allot-controller", bad])
            .unwrap_err()
            .to_string();
        assert!(e.contains(bad.split('=').next().unwrap()), "{e}");
    }
}
