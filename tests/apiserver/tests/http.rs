//! The test API server over loopback HTTP, as a binary started with a kubeconfig reaches it:
//! kube's own client, configured from the kubeconfig the server writes.

use allot_test_apiserver::ApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_client_from_the_kubeconfig_creates_reads_and_loses_a_stale_update() {
    let server = ApiServer::new();
    let addr = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let yaml = ApiServer::kubeconfig(&format!("http://{addr}"));
    let kubeconfig: kube::config::Kubeconfig = serde_yaml::from_str(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut map = ConfigMap::default();
    map.metadata.name = Some("policy".into());
    map.data = Some([("k".to_string(), "v".to_string())].into());
    let created = maps.create(&PostParams::default(), &map).await.unwrap();
    let read = maps.get("policy").await.unwrap();
    assert_eq!(read.data, map.data);
    assert_eq!(
        read.metadata.resource_version,
        created.metadata.resource_version
    );
    let mut newer = read.clone();
    newer.data = Some([("k".to_string(), "w".to_string())].into());
    maps.replace("policy", &PostParams::default(), &newer)
        .await
        .unwrap();
    let stale = maps.replace("policy", &PostParams::default(), &read).await;
    match stale {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("a stale update must lose with 409 Conflict, got {other:?}"),
    }
    assert_eq!(server.requests("update", "configmaps"), 2);
}

/// Lists come in pages when asked (`limit`, `continue`), in name order, as kube's watcher and
/// the Kubernetes store ask for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn lists_come_in_pages() {
    let server = ApiServer::new();
    for ns in ["a", "a-b"] {
        for name in ["m1", "m2", "m3"] {
            server.insert(
                "configmaps",
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"namespace": ns, "name": name}}),
            );
        }
    }
    let maps: Api<ConfigMap> = Api::all(server.client());
    let mut params = kube::api::ListParams::default().limit(4);
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut versions = Vec::new();
    loop {
        let page = maps.list(&params).await.unwrap();
        pages += 1;
        versions.push(page.metadata.resource_version.clone());
        seen.extend(page.items.iter().map(|m| {
            format!(
                "{}/{}",
                m.metadata.namespace.as_deref().unwrap(),
                m.metadata.name.as_deref().unwrap()
            )
        }));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => params = params.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(seen, ["a/m1", "a/m2", "a/m3", "a-b/m1", "a-b/m2", "a-b/m3"]);
    assert_eq!(versions[0], versions[1], "one snapshot's version");
}
