//! The rows themselves, in the API every build has: compiled into the
//! current rows crate (`lib.rs`) and, by `scripts/same-process-rows.sh`, into
//! the legacy one (`bench/rows/legacy/lib.rs`, for builds from before the
//! soundness change). Where the two APIs differ, the crate root's macros say
//! how: `stream_order!(gpu, stream)` (the stream's access order on device 0),
//! `new_scratchpad!(gpu, order)`, `lease_handle!(lease)` and
//! `destroy_stream!(gpu, stream)` (a `Result`). Macros, not functions, so that
//! the timed closures are the very code each API's rows were written as.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpupool_core::{
    AccessOrder, EventPool, MemoryKind, ScratchBackend, ScratchSizes, Scratchpad, StreamOptions,
    StreamPool, StreamPoolConfig,
};

/// The side-by-side benchmark's round: 16 allocations of these sizes.
const SIZES: [usize; 16] = [
    1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
];
const ALIGN: usize = 8;
/// The block of the backend rows: about what a learned round takes.
const BACKEND_BLOCK: usize = 1 << 18;
const D: gpupool_core::DeviceId = gpupool_core::DeviceId(0);

/// A row: its name, and one operation.
pub type Row<'a> = (String, Box<dyn FnMut() + 'a>);

/// Makes the rows on device 0 of `gpu` (CUDA: there must be a driver and a
/// GPU), hands them to `f`, then checks that no lease is left out and destroys
/// the stream the scratch rows used. The rows are in a fixed order; the first
/// is a control that touches neither the driver nor gpupool.
pub fn with_rows<B: ScratchBackend, R>(gpu: &B, f: impl FnOnce(&mut [Row<'_>]) -> R) -> R {
    let stream = gpu
        .create_stream(D, StreamOptions::default())
        .expect("a stream");
    let order = stream_order!(gpu, stream);
    let streams = StreamPool::new(gpu);
    let sticky = StreamPool::with_config(
        gpu,
        StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        },
    );
    let events = EventPool::new(gpu);
    let sizes = ScratchSizes::new();
    let kinds = [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device];
    let mut kept: Vec<Scratchpad<'_, B>> =
        kinds.iter().map(|_| new_scratchpad!(gpu, order)).collect();
    let mut control_x = 0x2545_F491_4F6C_DD1Du64;

    let mut rows: Vec<Row<'_>> = vec![
        (
            "control: arithmetic".into(),
            Box::new(|| {
                let mut x = control_x;
                for _ in 0..256 {
                    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (x >> 29);
                }
                control_x = black_box(x);
            }),
        ),
        (
            "stream lease+return".into(),
            Box::new(|| {
                black_box(lease_handle!(streams.get(D).expect("a stream lease")));
            }),
        ),
        (
            "stream lease+return, same-thread reuse".into(),
            Box::new(|| {
                black_box(lease_handle!(sticky.get(D).expect("a stream lease")));
            }),
        ),
        (
            "event get+put".into(),
            Box::new(|| {
                black_box(lease_handle!(events.get(D).expect("an event lease")));
            }),
        ),
    ];
    for (kind, pad) in kinds.into_iter().zip(kept.iter_mut()) {
        let name = match kind {
            MemoryKind::Host => "host",
            MemoryKind::Pinned => "pinned",
            _ => "device",
        };
        let sizes = &sizes;
        rows.push((
            format!("scratch {name}: new each round"),
            Box::new(move || {
                let p = new_scratchpad!(gpu, order);
                for &n in &SIZES {
                    black_box(p.alloc(kind, n, ALIGN).expect("scratch"));
                }
            }),
        ));
        rows.push((
            format!("scratch {name}: new each round, learned sizes"),
            Box::new(move || {
                let p = new_scratchpad!(gpu, order).learn_sizes(sizes);
                for &n in &SIZES {
                    black_box(p.alloc(kind, n, ALIGN).expect("scratch"));
                }
            }),
        ));
        rows.push((
            format!("scratch {name}: reset reuse"),
            Box::new(move || {
                for &n in &SIZES {
                    black_box(pad.alloc(kind, n, ALIGN).expect("scratch"));
                }
                pad.reset().expect("a reset");
            }),
        ));
    }

    rows.push((
        "scratch: new and drop, nothing allocated".into(),
        Box::new(move || {
            black_box(&new_scratchpad!(gpu, order));
        }),
    ));
    // The backend's own share of a round: one block taken from it and given
    // back in the stream's order (about the size of a learned round's
    // block).
    for (kind, name) in [
        (MemoryKind::Pinned, "pinned"),
        (MemoryKind::Device, "device"),
    ] {
        rows.push((
            format!("backend {name}: block in and out, stream order"),
            Box::new(move || {
                // SAFETY: `stream` is a live stream of device 0 of `gpu`;
                // the block is freed once, in its order, and never used.
                unsafe {
                    let p = gpu
                        .allocate_async(kind, D, BACKEND_BLOCK, 256, stream)
                        .expect("a block");
                    gpu.deallocate_async(kind, D, black_box(p), BACKEND_BLOCK, 256, stream)
                        .expect("freed");
                }
            }),
        ));
    }

    let result = f(&mut rows);

    drop(rows);
    drop(kept);
    assert_eq!(streams.live_leases(), 0, "stream leases left out");
    assert_eq!(events.live_leases(), 0, "event leases left out");
    drop((streams, sticky, events));
    destroy_stream!(gpu, stream).expect("destroying the stream");
    result
}

/// Runs `f` `n` times; the time taken.
pub fn time(f: &mut dyn FnMut(), n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed()
}

/// How many runs of `f` take about `target`.
pub fn calibrate(f: &mut dyn FnMut(), target: Duration) -> usize {
    let mut n = 16usize;
    loop {
        let t = time(f, n);
        if t >= target / 10 || n >= 1 << 26 {
            let per = t.as_secs_f64().max(1e-9) / n as f64;
            break ((target.as_secs_f64() / per) as usize).clamp(16, 1 << 26);
        }
        n *= 4;
    }
}
