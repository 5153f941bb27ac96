package main

import (
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/ibverbs"
)

// rdmaProviders are the transports over real RDMA hardware, preferred
// over the software one.
func rdmaProviders(cfg ibverbs.Config) []verbs.Provider {
	return []verbs.Provider{ibverbs.New(cfg)}
}
