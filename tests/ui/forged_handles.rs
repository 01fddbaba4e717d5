// Finding 1: safe code cannot make a handle from a number.
#![forbid(unsafe_code)]
use gpupool_core::{EventHandle, StreamHandle};

fn main() {
    let _stream = StreamHandle(0xdead);
    let _event = EventHandle(0xdead);
}
