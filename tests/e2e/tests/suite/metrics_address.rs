//! `allot-agent --metrics-address`: `/metrics`, `/healthz` and `/readyz` over TCP for Prometheus
//! and the kubelet (the chart's DaemonSet probes and scrapes them), and nothing else of the API.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use allot_e2e::{Agent, ippool};

fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    (status, reply)
}

#[test]
fn metrics_health_and_readiness_are_served_over_tcp_and_nothing_else() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let address = format!("127.0.0.1:{port}");
    let _agent = Agent::start_with(
        &ippool("tcp-metrics", "10.77.0.0/24", None, &[]),
        &[("--metrics-address", &address)],
    );
    let (status, body) = get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    let free = body
        .lines()
        .find_map(|l| l.strip_prefix("allot_pool_addresses{pool=\"tcp-metrics\",state=\"free\"} "))
        .map(|v| v.parse::<f64>());
    assert_eq!(free, Some(Ok(254.0)), "{body}");
    assert!(
        body.contains("allot_policy_faults_total{kind=\"trap\",outcome=\"failed\"} 0"),
        "{body}"
    );
    assert_eq!(get(port, "/healthz").0, 200);
    assert_eq!(get(port, "/readyz").0, 200);
    // The plugin API, status (pool and pod names) and decisions stay on the socket.
    for path in ["/v1/status", "/v1/decisions", "/v1/add"] {
        assert_eq!(get(port, path).0, 404, "{path}");
    }
}
