package loader

// These tests load programs and read the verifier's answer, whose wording
// is the kernel's, so make test-kernels runs them on every kernel of
// the matrix (hack/kernel-packages.sh lists the packages that carry the
// line below).
//
//kpr:kernel-matrix
