// Command etcd is the etcd server that the kpr test API server stores its
// objects in. It is built from the same etcd release that k8s.io/kubernetes
// v1.37.2 depends on, so the pair is known to work together.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
