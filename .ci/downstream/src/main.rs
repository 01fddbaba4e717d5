//! An application on gpupool: the same code on the mock (default) and on CUDA
//! (`--features cuda`). It leases two streams, orders one after the other,
//! round-trips a buffer through device scratch memory and checks it.

use gpupool::{DefaultError, Scratchpad};

fn run() -> Result<usize, DefaultError> {
    let upload = gpupool::streams().get(0)?;
    let compute = gpupool::streams().get(0)?;
    let scratch = Scratchpad::new(gpupool::backend(), compute.order())?;
    let input: Vec<u64> = (0..4096).map(|i| i * i).collect();
    let on_device = scratch.to_device(&input)?;
    compute.order().wait(&upload.order(), gpupool::events())?;
    let back = scratch.to_host(&on_device)?;
    assert_eq!(back, input, "the round trip changed the data");
    Ok(back.len())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(n) => {
            println!("downstream: {n} elements round-tripped");
            println!("OK");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            // On a machine without a GPU the CUDA build ends here.
            eprintln!("downstream: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            std::process::ExitCode::FAILURE
        }
    }
}
