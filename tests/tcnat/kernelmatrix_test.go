package tcnat

// These tests attach the tc programs in network namespaces and send
// packets through them: tcx, the FIB lookup and the verifier differ between
// kernels, so make test-kernels runs them on every kernel of the matrix
// (hack/kernel-packages.sh lists the packages that carry the line below).
//
//kpr:kernel-matrix
