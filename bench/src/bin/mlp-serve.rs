//! A real workload, three ways, side by side in one run: worker threads serve
//! requests, each a 3-layer MLP of width 1,024 on a batch of `B` vectors
//! (cuBLAS SGEMM, then bias and ReLU in a small kernel): the input uploaded,
//! the activations (and, for gpupool, cuBLAS's workspace) in memory made for
//! the request, the result read back and checked against a CPU reference.
//!
//! - **gpupool**: a stream lease and a scratchpad per request; cuBLAS's
//!   workspace is scratch memory too.
//! - **cudarc, as its documentation teaches**: a new stream per request
//!   (`CudaContext::new_stream`), an allocation per tensor (`clone_htod`,
//!   `alloc_zeros`), event tracking on (cudarc's default).
//! - **cudarc, tuned by hand**: one stream per worker thread, made once;
//!   event tracking off; allocations from the driver's stream-ordered pool
//!   (`CudaStream::alloc`, which is `cuMemAllocAsync` where the device has
//!   memory pools) without zeroing.
//!
//! Every design keeps one cuBLAS handle per worker thread (made before the
//! timed window) and points it at the request's stream; the weights live in
//! device memory uploaded once. Requests per second and the latency of one
//! request (p50, p99) at 1, 4 and 16 threads, `B` = 1 and 32; the designs and
//! thread counts take turns, `REPEATS` times, and the figures are medians.
//! Every result is compared with the CPU's (one of a few inputs per `B`,
//! computed once); one wrong element fails the run.
//!
//! CUDA only: `cargo build --release -p gpupool-bench --features cuda --bin
//! mlp-serve`, run on a GPU machine (needs `libcublas` and `libnvrtc` where
//! the loader finds them). Without a GPU it says "skipped" and exits 0.
//! Environment: `MLP_WINDOW_MS` (per cell, default 600), `MLP_REPEATS`
//! (default 3), `MLP_THREADS` (default `1,4,16`), `OUT` (where `mlp.json`
//! goes).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use gpupool_bench::gpu::cuda_or_skip;
use gpupool_bench::sys_stats::upper_median as median;
use gpupool_core::{DeviceId, Scratchpad, StreamPool};
use gpupool_cuda::{with_cudarc_stream, CudaBackend, DeviceSliceExt};

/// The width of every layer.
const WIDTH: usize = 1024;
/// Layers per request.
const LAYERS: usize = 3;
/// Distinct inputs per batch size (their CPU results are computed once).
const INPUTS: usize = 4;
/// The cuBLAS workspace each gpupool request gives the handle.
const WORKSPACE: usize = 4 << 20;
const D: DeviceId = DeviceId(0);

/// `y[i] = max(0, y[i] + b[i % width])` for `i < n` (column-major
/// activations: one column per vector).
const BIAS_RELU: &str = r#"
extern "C" __global__ void bias_relu(float *y, const float *b, unsigned n, unsigned width) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = y[i] + b[i % width];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
"#;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// A small deterministic generator (xorshift64*), values in [-scale, scale).
struct Rng(u64);

impl Rng {
    fn next(&mut self, scale: f32) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        (bits as f32 / (1u64 << 23) as f32 - 1.0) * scale
    }
}

/// The model on the host: each layer's weights (column-major, `WIDTH` ×
/// `WIDTH`) and bias.
struct HostModel {
    weights: Vec<Vec<f32>>,
    biases: Vec<Vec<f32>>,
}

impl HostModel {
    fn new() -> Self {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let scale = 1.0 / (WIDTH as f32).sqrt();
        let weights = (0..LAYERS)
            .map(|_| (0..WIDTH * WIDTH).map(|_| rng.next(scale)).collect())
            .collect();
        let biases = (0..LAYERS)
            .map(|_| (0..WIDTH).map(|_| rng.next(0.1)).collect())
            .collect();
        HostModel { weights, biases }
    }

    /// The model's output for `x` (`batch` columns of `WIDTH`), on the CPU.
    fn forward(&self, x: &[f32], batch: usize) -> Vec<f32> {
        let mut act = x.to_vec();
        for (w, b) in self.weights.iter().zip(&self.biases) {
            let mut out = vec![0f32; WIDTH * batch];
            for c in 0..batch {
                let col = &act[c * WIDTH..(c + 1) * WIDTH];
                let dst = &mut out[c * WIDTH..(c + 1) * WIDTH];
                for (k, &xk) in col.iter().enumerate() {
                    let wk = &w[k * WIDTH..(k + 1) * WIDTH];
                    for (d, &wv) in dst.iter_mut().zip(wk) {
                        *d += wv * xk;
                    }
                }
                for (d, &bv) in dst.iter_mut().zip(b) {
                    *d = (*d + bv).max(0.0);
                }
            }
            act = out;
        }
        act
    }
}

/// The inputs of one batch size and their CPU results.
struct Cases {
    batch: usize,
    inputs: Vec<Vec<f32>>,
    expected: Vec<Vec<f32>>,
}

impl Cases {
    /// Input `case`, its result into `out`.
    #[inline]
    fn request<'r>(&'r self, case: usize, out: &'r mut [f32]) -> Request<'r> {
        Request {
            x: &self.inputs[case],
            batch: self.batch,
            out,
        }
    }

    fn new(model: &HostModel, batch: usize) -> Self {
        let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ batch as u64);
        let inputs: Vec<Vec<f32>> = (0..INPUTS)
            .map(|_| (0..WIDTH * batch).map(|_| rng.next(1.0)).collect())
            .collect();
        let expected = inputs.iter().map(|x| model.forward(x, batch)).collect();
        Cases {
            batch,
            inputs,
            expected,
        }
    }

    /// Whether `got` is case `i`'s result (to single precision's rounding
    /// over 1,024-term sums).
    fn check(&self, i: usize, got: &[f32]) -> Result<(), Failure> {
        let want = &self.expected[i];
        if got.len() != want.len() {
            return Err(format!("{} elements, expected {}", got.len(), want.len()).into());
        }
        for (e, (&g, &w)) in got.iter().zip(want).enumerate() {
            if (g - w).abs() > 1e-3 * (1.0 + w.abs()) {
                return Err(
                    format!("B = {}, input {i}, element {e}: {g} != {w}", self.batch).into(),
                );
            }
        }
        Ok(())
    }
}

/// The model on the device, shared by every design.
struct DeviceModel {
    weights: Vec<CudaSlice<f32>>,
    biases: Vec<CudaSlice<f32>>,
    /// The same memory as device addresses, for the gpupool design's raw
    /// cuBLAS calls and launches.
    weight_ptrs: Vec<u64>,
    bias_ptrs: Vec<u64>,
}

impl DeviceModel {
    fn new(ctx: &Arc<CudaContext>, host: &HostModel) -> Result<Self, Failure> {
        let stream = ctx.default_stream();
        let weights = host
            .weights
            .iter()
            .map(|w| stream.clone_htod(w))
            .collect::<Result<Vec<_>, _>>()?;
        let biases = host
            .biases
            .iter()
            .map(|b| stream.clone_htod(b))
            .collect::<Result<Vec<_>, _>>()?;
        let ptr = |s: &CudaSlice<f32>| s.device_ptr(&stream).0;
        let weight_ptrs = weights.iter().map(ptr).collect();
        let bias_ptrs = biases.iter().map(ptr).collect();
        stream.synchronize()?;
        Ok(DeviceModel {
            weights,
            biases,
            weight_ptrs,
            bias_ptrs,
        })
    }
}

/// A design's per-thread state and its request.
trait Design: Sized {
    const NAME: &'static str;
    fn for_thread(shared: &Shared) -> Result<Self, Failure>;
    /// Serves one request: `req.x` in, the result into `req.out`.
    fn serve(&mut self, shared: &Shared, req: &mut Request<'_>) -> Result<(), Failure>;
}

/// One request: `batch` inputs of `WIDTH` (`x`, column-major) and where
/// their result goes.
struct Request<'r> {
    x: &'r [f32],
    batch: usize,
    out: &'r mut [f32],
}

/// What every design's threads share.
struct Shared {
    gpu: CudaBackend,
    streams: StreamPool<CudaBackend>,
    /// Event tracking on (cudarc's default): the plain design.
    tracked: Arc<CudaContext>,
    /// Event tracking off: the tuned design.
    untracked: Arc<CudaContext>,
    /// The model, uploaded through each context (the tuned design's in the
    /// context without event tracking); gpupool uses the first's addresses.
    model: DeviceModel,
    model_untracked: DeviceModel,
    /// The bias kernel, loaded in each context.
    kernel_tracked: CudaFunction,
    kernel_untracked: CudaFunction,
    /// The same kernel through gpupool's context handle (the primary
    /// context, as the others).
    kernel_gpupool: CudaFunction,
}

fn gemm_config(batch: usize) -> GemmConfig<f32> {
    GemmConfig {
        transa: blas_sys::cublasOperation_t::CUBLAS_OP_N,
        transb: blas_sys::cublasOperation_t::CUBLAS_OP_N,
        m: WIDTH as i32,
        n: batch as i32,
        k: WIDTH as i32,
        alpha: 1.0,
        lda: WIDTH as i32,
        ldb: WIDTH as i32,
        beta: 0.0,
        ldc: WIDTH as i32,
    }
}

fn launch_config(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

/// gpupool: a stream lease and a scratchpad per request.
struct Pooled {
    handle: blas_sys::cublasHandle_t,
}

impl Design for Pooled {
    const NAME: &'static str = "gpupool";

    fn for_thread(_: &Shared) -> Result<Self, Failure> {
        // `cell` made the primary context current on this thread.
        Ok(Pooled {
            handle: blas::create_handle()?,
        })
    }

    fn serve(&mut self, shared: &Shared, req: &mut Request<'_>) -> Result<(), Failure> {
        let n = WIDTH * req.batch;
        let lease = shared.streams.get(D)?;
        let scratch = Scratchpad::new(&shared.gpu, lease.order())?;
        let input = scratch.to_device(req.x)?;
        let acts = [
            scratch.device::<f32>(n)?,
            scratch.device::<f32>(n)?,
            scratch.device::<f32>(n)?,
        ];
        let workspace = scratch.device::<u8>(WORKSPACE)?;
        let cfg = gemm_config(req.batch);
        // SAFETY: the handle is this thread's; the stream is the lease's,
        // live while it is held; the workspace is scratch memory in that
        // stream's order, used by the calls below only (the next request
        // sets another before any call).
        unsafe {
            blas::set_stream(self.handle, lease.handle().as_raw() as _)?;
            blas_sys::cublasSetWorkspace_v2(self.handle, workspace.addr() as _, WORKSPACE)
                .result()?;
        }
        let mut src = input.addr() as u64;
        for (layer, act) in acts.iter().enumerate() {
            // SAFETY: column-major operands of the sizes in `cfg`: the
            // weights (`WIDTH` × `WIDTH`, read-only device memory uploaded
            // before the workers started), `src` (`WIDTH` × `batch`: the
            // input or the previous layer's output), `act` (the same size),
            // all scratch memory of this request in the lease's order.
            unsafe {
                blas::sgemm(
                    self.handle,
                    cfg.transa,
                    cfg.transb,
                    cfg.m,
                    cfg.n,
                    cfg.k,
                    &cfg.alpha,
                    shared.model.weight_ptrs[layer] as *const f32,
                    cfg.lda,
                    src as *const f32,
                    cfg.ldb,
                    &cfg.beta,
                    act.addr() as *mut f32,
                    cfg.ldc,
                )?;
            }
            let (y, bias) = (act.kernel_arg(), shared.model.bias_ptrs[layer]);
            let (count, width) = (n as u32, WIDTH as u32);
            with_cudarc_stream(&lease, |s| {
                let mut launch = s.launch_builder(&shared.kernel_gpupool);
                launch.arg(&y).arg(&bias).arg(&count).arg(&width);
                // SAFETY: `bias_relu(float *, const float *, unsigned,
                // unsigned)`: `y` holds `n` floats of scratch memory in this
                // stream's order, `bias` `WIDTH` floats of the model; no
                // argument carries cudarc events.
                unsafe { launch.launch(launch_config(n)) }.map(|_| ())
            })??;
            src = act.addr() as u64;
        }
        scratch.copy_to_host(&acts[LAYERS - 1], req.out)?;
        Ok(())
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        // SAFETY: made by `create_handle`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}

/// cudarc as taught: a new stream and new allocations per request, event
/// tracking on.
struct Plain {
    blas: CudaBlas,
}

impl Design for Plain {
    const NAME: &'static str = "cudarc, as taught";

    fn for_thread(shared: &Shared) -> Result<Self, Failure> {
        Ok(Plain {
            blas: CudaBlas::new(shared.tracked.default_stream())?,
        })
    }

    fn serve(&mut self, shared: &Shared, req: &mut Request<'_>) -> Result<(), Failure> {
        let stream = shared.tracked.new_stream()?;
        let (model, kernel) = (&shared.model, &shared.kernel_tracked);
        serve_cudarc(&mut self.blas, &stream, model, kernel, req, true)
    }
}

/// cudarc tuned by hand: one stream per thread, event tracking off, pool
/// allocations without zeroing.
struct Tuned {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Design for Tuned {
    const NAME: &'static str = "cudarc, tuned";

    fn for_thread(shared: &Shared) -> Result<Self, Failure> {
        let stream = shared.untracked.new_stream()?;
        Ok(Tuned {
            blas: CudaBlas::new(stream.clone())?,
            stream,
        })
    }

    fn serve(&mut self, shared: &Shared, req: &mut Request<'_>) -> Result<(), Failure> {
        let stream = self.stream.clone();
        let (model, kernel) = (&shared.model_untracked, &shared.kernel_untracked);
        serve_cudarc(&mut self.blas, &stream, model, kernel, req, false)
    }
}

/// One request through cudarc's safe API on `stream`.
fn serve_cudarc(
    blas: &mut CudaBlas,
    stream: &Arc<CudaStream>,
    model: &DeviceModel,
    kernel: &CudaFunction,
    req: &mut Request<'_>,
    zeroed: bool,
) -> Result<(), Failure> {
    let n = WIDTH * req.batch;
    // SAFETY: the handle is this thread's and is pointed at `stream`, which
    // every operand below is used on.
    unsafe { blas.set_stream(stream.clone()) }?;
    let input = stream.clone_htod(req.x)?;
    let mut acts: Vec<CudaSlice<f32>> = (0..LAYERS)
        .map(|_| {
            if zeroed {
                stream.alloc_zeros::<f32>(n)
            } else {
                // SAFETY: every element is written by the layer's SGEMM
                // (beta = 0) before anything reads it.
                unsafe { stream.alloc::<f32>(n) }
            }
        })
        .collect::<Result<_, _>>()?;
    let cfg = gemm_config(req.batch);
    for layer in 0..LAYERS {
        let (done, rest) = acts.split_at_mut(layer);
        let act = &mut rest[0];
        let src = if layer == 0 { &input } else { &done[layer - 1] };
        // SAFETY: column-major operands of the sizes in `cfg`.
        unsafe { blas.gemm(cfg, &model.weights[layer], src, act) }?;
        let (count, width) = (n as u32, WIDTH as u32);
        let mut launch = stream.launch_builder(kernel);
        launch
            .arg(&mut *act)
            .arg(&model.biases[layer])
            .arg(&count)
            .arg(&width);
        // SAFETY: `bias_relu(float *, const float *, unsigned, unsigned)` on
        // `n` floats and a bias of `WIDTH`.
        unsafe { launch.launch(launch_config(n)) }?;
    }
    stream.memcpy_dtoh(&acts[LAYERS - 1], req.out)?;
    stream.synchronize()?;
    Ok(())
}

/// One cell's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
}

/// [`cell`] of one design.
type CellFn = fn(&Shared, &Cases, usize, Duration) -> Result<Figures, Failure>;

/// Runs `threads` workers of design `T` for `window`; every result checked.
fn cell<T: Design>(
    shared: &Shared,
    cases: &Cases,
    threads: usize,
    window: Duration,
) -> Result<Figures, Failure> {
    let barrier = Barrier::new(threads);
    let per_thread: Vec<Result<Vec<u64>, Failure>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Vec<u64>, Failure> {
                    shared.tracked.bind_to_thread()?;
                    let mut design = T::for_thread(shared)?;
                    let mut out = vec![0f32; WIDTH * cases.batch];
                    // Warm up: pools, caches, cuBLAS's first-call setup.
                    for i in 0..4 {
                        design.serve(shared, &mut cases.request(i % INPUTS, &mut out))?;
                    }
                    barrier.wait();
                    let start = Instant::now();
                    let mut latencies = Vec::with_capacity(4096);
                    let mut i = t;
                    while start.elapsed() < window {
                        let case = i % INPUTS;
                        let t0 = Instant::now();
                        design.serve(shared, &mut cases.request(case, &mut out))?;
                        latencies.push(t0.elapsed().as_nanos() as u64);
                        cases.check(case, &out)?;
                        i += 1;
                    }
                    Ok(latencies)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect()
    });
    let mut all = Vec::new();
    let mut served = 0usize;
    for r in per_thread {
        let l = r?;
        served += l.len();
        all.extend(l);
    }
    all.sort_unstable();
    let q = |p: f64| all[((all.len() - 1) as f64 * p).round() as usize] as f64 / 1e3;
    Ok(Figures {
        per_second: served as f64 / window.as_secs_f64(),
        p50_us: q(0.5),
        p99_us: q(0.99),
    })
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Failure> {
    let Some(gpu) = cuda_or_skip() else {
        return Ok(());
    };
    let window = Duration::from_millis(env_usize("MLP_WINDOW_MS", 600) as u64);
    let repeats = env_usize("MLP_REPEATS", 3).max(1);
    let threads: Vec<usize> = std::env::var("MLP_THREADS")
        .unwrap_or_else(|_| "1,4,16".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .collect();

    let tracked = CudaContext::new(0)?;
    let untracked = CudaContext::new(0)?;
    // SAFETY: no work has been queued through this context object yet.
    unsafe { untracked.disable_event_tracking() };
    let ptx = cudarc::nvrtc::compile_ptx(BIAS_RELU)?;
    let kernel_tracked = tracked
        .load_module(ptx.clone())?
        .load_function("bias_relu")?;
    let kernel_untracked = untracked
        .load_module(ptx.clone())?
        .load_function("bias_relu")?;
    let kernel_gpupool = gpu
        .context(D)?
        .load_module(ptx)?
        .load_function("bias_relu")?;
    let host = HostModel::new();
    let model = DeviceModel::new(&tracked, &host)?;
    let model_untracked = DeviceModel::new(&untracked, &host)?;
    let shared = Shared {
        streams: StreamPool::new(gpu),
        gpu,
        tracked,
        untracked,
        model,
        model_untracked,
        kernel_tracked,
        kernel_untracked,
        kernel_gpupool,
    };
    let batches = [1usize, 32];
    let cases: Vec<Cases> = batches.iter().map(|&b| Cases::new(&host, b)).collect();

    type Cell = (&'static str, usize, usize);
    let mut runs: Vec<(Cell, Vec<Figures>)> = Vec::new();
    let mut record = |key: Cell, f: Figures| match runs.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(f),
        None => runs.push((key, vec![f])),
    };
    for repeat in 0..repeats {
        for c in &cases {
            for &t in &threads {
                let designs: [(&'static str, CellFn); 3] = [
                    (Pooled::NAME, cell::<Pooled>),
                    (Plain::NAME, cell::<Plain>),
                    (Tuned::NAME, cell::<Tuned>),
                ];
                // Each repeat starts with another design.
                for k in 0..designs.len() {
                    let (name, run) = designs[(k + repeat) % designs.len()];
                    let f = run(&shared, c, t, window)?;
                    eprintln!(
                        "repeat {repeat}: B = {}, {t} threads, {name}: {:.0} requests/s, p50 {:.1} µs, p99 {:.1} µs",
                        c.batch, f.per_second, f.p50_us, f.p99_us
                    );
                    record((name, c.batch, t), f);
                }
            }
        }
    }

    println!("# MLP serving: 3 layers of width {WIDTH}, cuBLAS SGEMM + bias/ReLU, every result checked\n");
    println!(
        "medians of {repeats} windows of {} ms per cell; latency of one request (lease or stream, memory, \
         upload, 3 layers, readback)\n",
        window.as_millis()
    );
    println!("| B | threads | design | requests/s | p50 µs | p99 µs | ÷ tuned (requests/s) |");
    println!("|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for c in &cases {
        for &t in &threads {
            let med = |name: &str| {
                runs.iter()
                    .find(|((n, b, th), _)| *n == name && *b == c.batch && *th == t)
                    .map(|(_, v)| Figures {
                        per_second: median(v.iter().map(|f| f.per_second).collect()),
                        p50_us: median(v.iter().map(|f| f.p50_us).collect()),
                        p99_us: median(v.iter().map(|f| f.p99_us).collect()),
                    })
            };
            let tuned = med(Tuned::NAME).map_or(f64::NAN, |f| f.per_second);
            for name in [Pooled::NAME, Plain::NAME, Tuned::NAME] {
                let Some(f) = med(name) else { continue };
                println!(
                    "| {} | {t} | {name} | {:.0} | {:.1} | {:.1} | {:.2}× |",
                    c.batch,
                    f.per_second,
                    f.p50_us,
                    f.p99_us,
                    f.per_second / tuned
                );
                json.push(format!(
                    "{{\"batch\":{},\"threads\":{t},\"design\":\"{name}\",\"requests_per_s\":{:.1},\"p50_us\":{:.2},\"p99_us\":{:.2}}}",
                    c.batch, f.per_second, f.p50_us, f.p99_us
                ));
            }
        }
    }
    if let Some(dir) = std::env::var_os("OUT") {
        let path = std::path::Path::new(&dir).join("mlp.json");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(&path, format!("[{}]\n", json.join(",\n")))?;
    }
    println!("\nOK");
    Ok(())
}
