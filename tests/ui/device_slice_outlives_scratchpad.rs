use gpupool_core::{AccessOrder, Scratchpad};
use gpupool_mock::MockBackend;

fn main() {
    let gpu = MockBackend::new(1);
    let slice = {
        let scratch = Scratchpad::new(&gpu, AccessOrder::host()).unwrap();
        scratch.device::<u32>(16).unwrap()
    };
    println!("{}", slice.len());
}
