// Tests of parameter-server checkpoints in one process: placeholder (issue 14).
