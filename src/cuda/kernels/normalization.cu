// Placeholder: filled by the CUDA part of issue 15.
