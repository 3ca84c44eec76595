//! Bad input to `allot`: malformed network configs, CNI environments and CNI_ARGS. Each is a CNI
//! error object with the spec's code and a message, never a panic, never a claim.
//!
//! Deliberately lenient (and so not here): a missing or null `ipam` section means all defaults
//! (the runtime execs allot only because some `ipam.type` named it), and a single string where a
//! pool list is expected is a one-element list (Spiderpool users write that).

use allot_e2e::*;
use serde_json::{Value, json};

fn pools() -> String {
    ippool(
        "p",
        "10.93.0.0/24",
        Some("10.93.0.1"),
        &["10.93.0.10-10.93.0.19"],
    )
}

/// The lab's bridge config with its ipam section changed by `edit`.
fn conf_with(lab: &Lab, edit: impl FnOnce(&mut Value)) -> String {
    let mut conf = lab.bridge_conf(&["p"], &[]);
    edit(&mut conf);
    conf.to_string()
}

#[track_caller]
fn expect_error_object(out: &CniOutput, codes: &[u64]) {
    out.expect_err(codes);
    let json = out.json.as_ref().unwrap();
    assert!(
        json["cniVersion"].is_string(),
        "the error object has no cniVersion:\n{out}"
    );
}

#[test]
fn malformed_network_configs_are_decode_or_config_errors() {
    let Some(lab) = Lab::new("malformed_network_configs", &pools()) else {
        return;
    };
    let cases: Vec<(&str, String)> = vec![
        ("empty stdin", String::new()),
        ("not JSON", "{\"cniVersion\": \"1.0.0\", \"name\": ".into()),
        ("JSON null", "null".into()),
        ("a JSON array", "[]".into()),
        ("a JSON string", "\"allot\"".into()),
        ("binary garbage", "\u{0}\u{1}\u{2}\u{ff}".into()),
        (
            "ipam is a string",
            conf_with(&lab, |c| c["ipam"] = json!("allot")),
        ),
        ("ipam is a list", conf_with(&lab, |c| c["ipam"] = json!([]))),
        (
            "ipam type is a number",
            conf_with(&lab, |c| c["ipam"]["type"] = json!(1)),
        ),
        (
            "unknown ipam field (typo)",
            conf_with(&lab, |c| c["ipam"]["defualt_ipv4_ippool"] = json!(["p"])),
        ),
        (
            "unknown ipam field",
            conf_with(&lab, |c| c["ipam"]["subnet"] = json!("10.0.0.0/8")),
        ),
        (
            "default_ipv4_ippool holds numbers",
            conf_with(&lab, |c| c["ipam"]["default_ipv4_ippool"] = json!([1, 2])),
        ),
        (
            "default_ipv6_ippool is an object",
            conf_with(&lab, |c| {
                c["ipam"]["default_ipv6_ippool"] = json!({"p": true})
            }),
        ),
        (
            "an empty pool name",
            conf_with(&lab, |c| c["ipam"]["default_ipv4_ippool"] = json!([""])),
        ),
        (
            "socket is a number",
            conf_with(&lab, |c| c["ipam"]["socket"] = json!(5)),
        ),
        (
            "socket is a relative path",
            conf_with(&lab, |c| c["ipam"]["socket"] = json!("agent.sock")),
        ),
        (
            "timeout_ms is a string",
            conf_with(&lab, |c| c["ipam"]["timeout_ms"] = json!("5")),
        ),
        (
            "name is missing",
            conf_with(&lab, |c| {
                c.as_object_mut().unwrap().remove("name");
            }),
        ),
        (
            "name is a number",
            conf_with(&lab, |c| c["name"] = json!(7)),
        ),
    ];
    let att = Attachment::new("bad-config");
    for (what, stdin) in &cases {
        let out = Cni::new(&lab.plugins, "allot", "ADD", stdin)
            .attachment(&att)
            .run(Some(&lab.host));
        assert!(!out.success(), "{what}: accepted:\n{out}");
        let code = out.code();
        assert!(
            matches!(code, Some(6 | 7)),
            "{what}: expected code 6 (decode) or 7 (invalid network config), got {code:?}:\n{out}"
        );
        expect_error_object(&out, &[6, 7]);
    }
    // None of it claimed anything, and a good config still works.
    assert_eq!(lab.agent.pool_counts("p"), (10, 10));
    let ok = lab.cni(
        "allot",
        "ADD",
        &Attachment::new("good"),
        &lab.bridge_conf(&["p"], &[]),
    );
    ok.expect_ok();
}

#[test]
fn malformed_cni_args_and_environments_are_invalid_environment_errors() {
    let Some(lab) = Lab::new("malformed_cni_args_and_environments", &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["p"], &[]).to_string();
    let pod = Attachment::new("env");
    let good = || Cni::new(&lab.plugins, "allot", "ADD", &conf).attachment(&pod);
    let with_args = |args: &str| good().set("CNI_ARGS", Some(args));
    let cases: Vec<(&str, Cni)> = vec![
        ("no CNI_ARGS", good().set("CNI_ARGS", None)),
        ("empty CNI_ARGS", with_args("")),
        (
            "no K8S_POD_NAME",
            with_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_UID=u1"),
        ),
        (
            "empty K8S_POD_NAME",
            with_args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=;K8S_POD_UID=u1"),
        ),
        (
            "no K8S_POD_NAMESPACE",
            with_args("K8S_POD_NAME=p;K8S_POD_UID=u1"),
        ),
        (
            "a pair without =",
            with_args("K8S_POD_NAMESPACE=default;garbage;K8S_POD_NAME=p"),
        ),
        ("only garbage", with_args(";;;===;;")),
        (
            "ALLOT_OWNER without a name",
            with_args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;ALLOT_OWNER=StatefulSet"),
        ),
        (
            "ALLOT_OWNER empty kind",
            with_args("K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;ALLOT_OWNER=/web"),
        ),
        ("no CNI_CONTAINERID", good().set("CNI_CONTAINERID", None)),
        (
            "empty CNI_CONTAINERID",
            good().set("CNI_CONTAINERID", Some("")),
        ),
        ("no CNI_IFNAME", good().set("CNI_IFNAME", None)),
        ("no CNI_NETNS", good().set("CNI_NETNS", None)),
        ("no CNI_COMMAND", good().set("CNI_COMMAND", None)),
        (
            "unknown CNI_COMMAND",
            good().set("CNI_COMMAND", Some("FROB")),
        ),
    ];
    for (what, call) in &cases {
        let out = call.run(Some(&lab.host));
        assert!(!out.success(), "{what}: accepted:\n{out}");
        assert_eq!(
            out.code(),
            Some(4),
            "{what}: expected code 4 (invalid environment):\n{out}"
        );
        expect_error_object(&out, &[4]);
    }
    assert_eq!(
        lab.agent.pool_counts("p"),
        (10, 10),
        "a rejected ADD claimed an address"
    );

    // A StatefulSet owner in the expected shape is accepted.
    let mut web = Attachment::new("web-0");
    web.owner = Some("StatefulSet/web".into());
    lab.bridge_add(&web, &lab.bridge_conf(&["p"], &[]));
}

#[test]
fn an_unreachable_socket_is_try_again_later() {
    let Some(lab) = Lab::new("an_unreachable_socket_is_try_again_later", &pools()) else {
        return;
    };
    for socket in ["/nonexistent/allot.sock", "/dev/null"] {
        // Within its timeout an ADD waits for an agent to listen; then it gives up with 11.
        let conf = conf_with(&lab, |c| {
            c["ipam"]["socket"] = json!(socket);
            c["ipam"]["timeout_ms"] = json!(1000);
        });
        let out = Cni::new(&lab.plugins, "allot", "ADD", &conf)
            .attachment(&Attachment::new("nowhere"))
            .run(Some(&lab.host));
        expect_error_object(&out, &[11]);
    }
}
