//! gpupool's own one-thread rows of the side-by-side benchmark (stream and
//! event pools, scratch rounds of each kind), short and interleaved, for
//! comparing two builds: `scripts/gpu-before-after.sh` runs two builds of
//! this example alternately, many times in a few minutes, and
//! `scripts/compare-rows.py` takes each row's median over the runs of each
//! build. The machine's speed drifts between runs (the GPU machine's
//! one-thread rows moved twofold within a session, H200 2026-12-02): short
//! runs, alternated, give the drift less room than a few long ones.
//!
//! Each row runs for about `TARGET`, once per repeat, the rows in turn within
//! each repeat; the figure is the median of `REPEATS`. The rows use only API
//! that every build since the soundness issue has. Writes `$OUT/rows.json`
//! (`{"row": ns, ...}`) and prints the table. Without a driver or a GPU it
//! says "skipped" and exits 0.
//!
//! `cargo run --release -p gpupool-cuda --example 08-one-thread-rows`

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpupool_core::{
    AccessOrder, Backend, DeviceId, EventPool, MemoryKind, ScratchSizes, Scratchpad, StreamBackend,
    StreamOptions, StreamPool, StreamPoolConfig,
};
use gpupool_cuda::CudaBackend;

const REPEATS: usize = 9;
const TARGET: Duration = Duration::from_millis(20);
/// The side-by-side benchmark's round: 16 allocations of these sizes.
const SIZES: [usize; 16] = [
    1, 24, 100, 512, 4096, 65536, 17, 3000, 8192, 40000, 64, 256, 1024, 12345, 50000, 2,
];
const ALIGN: usize = 8;
const D: DeviceId = DeviceId(0);

/// Runs `f` `n` times; the time taken.
fn time(f: &mut dyn FnMut(), n: usize) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let gpu = CudaBackend::new();
    match gpu.device_count() {
        Ok(n) if n > 0 => {}
        _ => {
            println!("skipped: no CUDA driver or no GPU");
            return;
        }
    }
    let stream = gpu
        .create_stream(D, StreamOptions::default())
        .expect("a stream");
    // SAFETY: `stream` was created on device 0 by `gpu` just above and is
    // destroyed at the end, after every scratchpad on it is gone; nothing
    // captures it.
    let order = unsafe { AccessOrder::from_raw(&gpu, stream, D) };
    let streams = StreamPool::new(&gpu);
    let sticky = StreamPool::with_config(
        &gpu,
        StreamPoolConfig {
            same_thread_reuse: true,
            ..StreamPoolConfig::default()
        },
    );
    let events = EventPool::new(&gpu);
    let sizes = ScratchSizes::new();
    let kinds = [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device];
    let mut kept: Vec<Scratchpad<'_, CudaBackend>> = kinds
        .iter()
        .map(|_| Scratchpad::new(&gpu, order).expect("a scratchpad"))
        .collect();
    let mut control_x = 0x2545_F491_4F6C_DD1Du64;

    let mut rows: Vec<(String, Box<dyn FnMut() + '_>)> = vec![
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
                black_box(streams.get(D).expect("a stream lease").handle());
            }),
        ),
        (
            "stream lease+return, same-thread reuse".into(),
            Box::new(|| {
                black_box(sticky.get(D).expect("a stream lease").handle());
            }),
        ),
        (
            "event get+put".into(),
            Box::new(|| {
                black_box(events.get(D).expect("an event lease").handle());
            }),
        ),
    ];
    for (kind, pad) in kinds.into_iter().zip(kept.iter_mut()) {
        let name = match kind {
            MemoryKind::Host => "host",
            MemoryKind::Pinned => "pinned",
            _ => "device",
        };
        let gpu = &gpu;
        let sizes = &sizes;
        rows.push((
            format!("scratch {name}: new each round"),
            Box::new(move || {
                let p = Scratchpad::new(gpu, order).expect("a scratchpad");
                for &n in &SIZES {
                    black_box(p.alloc(kind, n, ALIGN).expect("scratch"));
                }
            }),
        ));
        rows.push((
            format!("scratch {name}: new each round, learned sizes"),
            Box::new(move || {
                let p = Scratchpad::new(gpu, order)
                    .expect("a scratchpad")
                    .learn_sizes(sizes);
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

    let n: Vec<usize> = rows
        .iter_mut()
        .map(|(_, f)| {
            let mut n = 16usize;
            loop {
                let t = time(f, n);
                if t >= TARGET / 10 || n >= 1 << 26 {
                    let per = t.as_secs_f64().max(1e-9) / n as f64;
                    break ((TARGET.as_secs_f64() / per) as usize).clamp(16, 1 << 26);
                }
                n *= 4;
            }
        })
        .collect();
    let mut ns = vec![Vec::with_capacity(REPEATS); rows.len()];
    for _ in 0..REPEATS {
        for (i, (_, f)) in rows.iter_mut().enumerate() {
            ns[i].push(time(f, n[i]).as_nanos() as f64 / n[i] as f64);
        }
    }
    let names: Vec<String> = rows.into_iter().map(|(name, _)| name).collect();
    let figures: Vec<(String, f64)> = names
        .into_iter()
        .zip(ns)
        .map(|(name, v)| (name, median(v)))
        .collect();
    println!("| row | ns |");
    println!("|---|---|");
    for (name, ns) in &figures {
        println!("| {name} | {ns:.1} |");
    }
    if let Some(dir) = std::env::var_os("OUT") {
        let body: Vec<String> = figures
            .iter()
            .map(|(name, ns)| format!("  \"{name}\": {ns:.3}"))
            .collect();
        let path = std::path::Path::new(&dir).join("rows.json");
        std::fs::write(&path, format!("{{\n{}\n}}\n", body.join(",\n")))
            .expect("writing rows.json");
    }
    drop(kept);
    assert_eq!(streams.live_leases(), 0, "stream leases left out");
    assert_eq!(events.live_leases(), 0, "event leases left out");
    drop((streams, sticky, events));
    // SAFETY: every scratchpad on the stream is gone; nothing else holds it.
    unsafe { gpu.destroy_stream(stream, D) }.expect("destroying the stream");
    println!("OK");
}
