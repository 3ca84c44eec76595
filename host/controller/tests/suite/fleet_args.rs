//! Fleet ranges' flags as `allot-controller`'s own command line takes them.

use allot_controller::args::ControllerArgs;
use allot_controller::fleet::FleetArgs;
use clap::CommandFactory;

fn parse(argv: &[&str]) -> Result<FleetArgs, clap::Error> {
    let matches = ControllerArgs::command().try_get_matches_from(argv)?;
    ControllerArgs::from_matches(&matches, |_| None).map(|a| a.fleet)
}

#[test]
fn defaults_allocate_read_allot_dev_datacenter_and_copy_nothing() {
    let a = parse(&["allot-controller"]).unwrap();
    assert!(a.enabled);
    assert_eq!(a.datacenter_label, "allot.dev/datacenter");
    assert_eq!(a.cluster_api_version, "v1beta1");
    assert_eq!(a.resync_seconds, 600);
    assert!(!a.workload_configmap);
    assert_eq!(a.workload_namespace, "kube-system");
    assert_eq!(a.workload_timeout_seconds, 10);
}

#[test]
fn every_flag_is_taken() {
    let a = parse(&[
        "allot-controller",
        "--fleet=false",
        "--fleet-datacenter-label=topology.kubernetes.io/region",
        "--fleet-cluster-api-version=v1beta2",
        "--fleet-resync-seconds=30",
        "--fleet-workload-configmap=true",
        "--fleet-workload-namespace=metallb-system",
        "--fleet-workload-timeout-seconds=3",
    ])
    .unwrap();
    assert!(!a.enabled);
    assert_eq!(a.datacenter_label, "topology.kubernetes.io/region");
    assert_eq!(a.cluster_api_version, "v1beta2");
    assert_eq!(a.resync_seconds, 30);
    assert!(a.workload_configmap);
    assert_eq!(a.workload_namespace, "metallb-system");
    assert_eq!(a.workload_timeout_seconds, 3);
}

#[test]
fn bad_values_are_refused_with_what_was_expected() {
    for (flag, words) in [
        ("--fleet-datacenter-label=", "is not a label key"),
        ("--fleet-datacenter-label=Not A Label", "is not a label key"),
        (
            "--fleet-datacenter-label=UPPER.example/dc",
            "is not a label key",
        ),
        ("--fleet-cluster-api-version=beta1", "is not an API version"),
        (
            "--fleet-cluster-api-version=v1gamma1",
            "is not an API version",
        ),
        ("--fleet-resync-seconds=0", "0"),
        ("--fleet-workload-timeout-seconds=301", "301"),
        ("--fleet=maybe", "maybe"),
    ] {
        let e = parse(&["allot-controller", flag]).unwrap_err().to_string();
        assert!(e.contains(words), "{flag}: {e}");
    }
}

#[test]
fn the_fleet_switch_and_the_auto_pool_switch_are_two_flags() {
    for (fleet, auto_pools) in [(true, false), (false, true)] {
        let matches = ControllerArgs::command()
            .try_get_matches_from([
                "allot-controller".to_string(),
                format!("--fleet={fleet}"),
                format!("--auto-pools={auto_pools}"),
                "--fleet-resync-seconds=7".to_string(),
            ])
            .unwrap();
        let args = ControllerArgs::from_matches(&matches, |_| None).unwrap();
        assert_eq!(
            (args.fleet.enabled, args.auto_pools.enabled),
            (fleet, auto_pools)
        );
        assert_eq!(args.fleet.resync_seconds, 7);
        assert_eq!(args.auto_pools.resync_seconds, 60);
    }
}
