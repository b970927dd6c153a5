package monitor_test

import (
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
)

func cfg() compile.Config { return testrules.Config() }

// svc returns a service port with n endpoints, numbered from first.
var svc = testrules.Service

func listTable(t *testing.T, ns *testnetns.NS) string { return testrules.ListTable(t, ns) }
