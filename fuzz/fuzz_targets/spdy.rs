//! The kubelet's SPDY/3.1 framing (`kubectl port-forward` and the API server's streams reach
//! it): arbitrary bytes through one connection's decoder — no panic, whatever the frames and
//! their zlib-compressed header blocks hold — and what decodes encodes and decodes back to the
//! same frames on a new connection.
#![no_main]

use bytes::BytesMut;
use flotilla_kubelet::spdy::Codec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut codec = Codec::new().with_max_frame_length(1 << 20);
    let mut src = BytesMut::from(data);
    let mut frames = Vec::new();
    while let Ok(Some(frame)) = codec.decode(&mut src) {
        frames.push(frame);
    }
    let (mut sender, mut receiver) = (Codec::new(), Codec::new());
    let mut wire = BytesMut::new();
    for frame in &frames {
        if sender.encode(frame, &mut wire).is_err() {
            return;
        }
    }
    for frame in &frames {
        let again = receiver.decode(&mut wire).expect("what we encode decodes");
        assert_eq!(again.as_ref(), Some(frame));
    }
});
