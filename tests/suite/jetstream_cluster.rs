//! The bus against a 3-node JetStream cluster ([`NatsCluster`]): R3 streams,
//! a killed stream leader, reads through a client that knows every node.

use std::time::{Duration, Instant};

use crate::support::nats_cluster::NatsCluster;

/// Until `stream` has a leader other than `not`; its index.
async fn new_leader(cluster: &NatsCluster, stream: &str, not: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(Some(leader)) = cluster.stream_leader(stream).await
            && leader != not
        {
            return leader;
        }
        assert!(
            Instant::now() < deadline,
            "{stream} elected no new leader within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_three_node_cluster_elects_a_new_stream_leader_when_the_leader_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = NatsCluster::start(3, dir.path()).expect("start a 3-node cluster");
    let client = async_nats::connect(cluster.client_urls()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "R3SMOKE".into(),
        subjects: vec!["r3smoke.>".into()],
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .expect("an R3 stream on 3 nodes");
    js.publish("r3smoke.a", "one".into())
        .await
        .unwrap()
        .await
        .expect("an ack after quorum");
    let leader = cluster
        .stream_leader("R3SMOKE")
        .await
        .unwrap()
        .expect("a leader");
    cluster.kill(leader);
    assert!(!cluster.is_running(leader));
    let next = new_leader(&cluster, "R3SMOKE", leader).await;
    assert_ne!(next, leader);
    cluster.restart(leader).expect("restart the old leader");
    assert!(cluster.is_running(leader));
}
