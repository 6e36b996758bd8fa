package iptables

// These tests program the kernel's netfilter tables through both
// iptables variants (nft and legacy), which differ between kernels,
// so make test-kernels runs them on every kernel of the matrix
// (hack/kernel-packages.sh lists the packages that carry the line below).
//
//kpr:kernel-matrix
