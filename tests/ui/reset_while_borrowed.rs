use gpupool_core::{AccessOrder, Scratchpad};
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let mut scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
    let slice = scratch.host::<u32>(16).unwrap();
    scratch.reset().unwrap();
    slice[0].write(1);
}
