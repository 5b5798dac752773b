//! Fuzzes the protocol decoder: any bytes either decode or give an error,
//! never a panic; whatever decodes re-encodes to a message that decodes to
//! the same value; and validating a decoded op's buffer references against
//! registered buffers never panics.
//!
//!     cargo install cargo-fuzz
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_message

use hexlora_proto::protocol::*;

const REGISTERED: [RegisteredBuffer; 3] = [
    RegisteredBuffer { id: 1, len: 4096 },
    RegisteredBuffer { id: 2, len: u32::MAX as u64 + 7 },
    RegisteredBuffer { id: 3, len: 0 },
];

pub fn run(bytes: &[u8]) {
    if let Ok(request) = decode::<Request>(bytes) {
        let mut buf = [0u8; MAX_MESSAGE_BYTES];
        let n = encode(&request, &mut buf).expect("a decoded request fits MAX_MESSAGE_BYTES").len();
        assert_eq!(decode::<Request>(&buf[..n]), Ok(request));
        match request {
            Request::Project(op) => {
                let shape = WeightShape { rows: op.tokens.rotate_left(7), cols: op.projection };
                let _ = op.validate(shape, &REGISTERED);
            }
            Request::LoadWeights(lw) => {
                let _ = lw.validate(&REGISTERED);
            }
            _ => {}
        }
    }
    if let Ok(response) = decode::<Response>(bytes) {
        let mut buf = [0u8; MAX_MESSAGE_BYTES];
        let n = encode(&response, &mut buf).expect("a decoded response fits MAX_MESSAGE_BYTES").len();
        assert_eq!(decode::<Response>(&buf[..n]), Ok(response));
    }
}
