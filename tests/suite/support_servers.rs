//! The test support's own servers work: later issues stand on them.

use std::time::Duration;

use crate::support::nats::nats_url;

#[tokio::test]
async fn the_throwaway_nats_server_has_jetstream_and_room_for_a_full_body() {
    let client = async_nats::connect(nats_url())
        .await
        .expect("connect to the test NATS");
    assert!(
        client.server_info().max_payload >= 1024 * 1024 + 64 * 1024,
        "max_payload {} cannot carry a 1 MiB body plus headers",
        client.server_info().max_payload
    );
    let js = async_nats::jetstream::new(client);
    let name = format!("ACS_SUPPORT_{}", uuid::Uuid::new_v4().simple());
    let mut stream = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .expect("JetStream is enabled");
    let ack = js
        .publish(format!("{name}.x"), "hello".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let stored = tokio::time::timeout(Duration::from_secs(5), stream.get_raw_message(ack.sequence))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&stored.payload[..], b"hello");
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    js.delete_stream(&name).await.unwrap();
}
