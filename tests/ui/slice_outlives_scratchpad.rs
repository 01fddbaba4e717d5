use gpupool_core::{AccessOrder, Scratchpad};
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let slice = {
        let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
        scratch.host::<u32>(16).unwrap()
    };
    slice[0].write(1);
}
