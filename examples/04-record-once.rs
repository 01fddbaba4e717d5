//! 04-record-once: record a pooled event once, wait on it from many streams,
//! with no `unsafe` (DALI's "record once, wait many").
//!
//! One lease uploads a buffer into scratch device memory (the copy runs in
//! its stream's order) and records a pooled event after it; three other
//! leases make their streams wait on that event and each reads the buffer
//! back in its own order. Every element is checked.
//!
//! Run on the process-wide mock (`cargo run --release --example
//! 04-record-once`), in the mock's checking mode, where a missing wait
//! panics where it happens (`GPUPOOL_MOCK_CHECK=1`), or on a GPU
//! (`--features cuda,cuda-12080`).
#![forbid(unsafe_code)]

use gpupool::{DefaultError, Scratchpad};

const ELEMENTS: usize = 1 << 16;
const READERS: usize = 3;

fn main() -> Result<(), DefaultError> {
    let (backend, streams, events) = (gpupool::backend(), gpupool::streams(), gpupool::events());
    let data: Vec<u32> = (0..ELEMENTS as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();

    let producer = streams.get(0)?;
    let upload = Scratchpad::new(backend, producer.order())?;
    let on_device = upload.to_device(&data)?; // copied in `producer`'s order
    let ready = events.get(0)?;
    ready.record(&producer.order())?; // once

    let readers = (0..READERS)
        .map(|_| streams.get(0))
        .collect::<Result<Vec<_>, _>>()?;
    for reader in &readers {
        reader.order().wait_event(&ready)?; // many
        let scratch = Scratchpad::new(backend, reader.order())?;
        let back = scratch.to_host(&on_device)?; // read in `reader`'s order
        assert_eq!(back, data, "a reader saw the buffer before the upload");
    }
    println!(
        "{READERS} streams waited on one event and read {ELEMENTS} elements each, all checked"
    );
    let found = gpupool::take_errors();
    assert!(found.is_clean(), "{found:?}");
    println!("OK");
    Ok(())
}
