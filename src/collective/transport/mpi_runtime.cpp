// MPI start-up and shut-down (placeholder).
