//! loom models of gpupool (see tests/).
