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
