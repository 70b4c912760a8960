"""verify: launch every built instance (PyCUDA backend, or the numpy fake in CI) on a set of problems and
check it against a higher-precision reference, with fault isolation and JSON / JUnit reports."""
