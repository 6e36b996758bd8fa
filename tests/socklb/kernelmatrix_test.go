package socklb

// These tests load the socket programs and attach them to cgroups:
// what the verifier accepts and which hooks exist differ between
// kernels, so make test-kernels runs them on every kernel of the matrix
// (hack/kernel-packages.sh lists the packages that carry the line below).
//
//kpr:kernel-matrix
