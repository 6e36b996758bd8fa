package ipvs

// These tests program the kernel's IPVS tables and the netfilter rules
// beside them, which differ between kernels, so make test-kernels runs
// them on every kernel of the matrix (hack/kernel-packages.sh lists the
// packages that carry the line below).
//
//kpr:kernel-matrix
