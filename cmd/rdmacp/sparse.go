package main

import (
	"github.com/rdmacp/rdmacp/initiator/local"
	"github.com/urfave/cli/v2"
)

// sparseOptions reads -S/--sparse and --zero for a single-file pull.
func sparseOptions(c *cli.Context) (bool, local.ZeroMode, error) {
	z, err := local.ParseZeroMode(c.String("zero"))
	if err != nil {
		return false, 0, usageError{err}
	}
	return c.Bool("sparse"), z, nil
}

// checkSparseFlags refuses -S and --zero where they do not apply yet:
// trees and manifests land through their own paths, which do not take
// them (their sources' holes stay holes all the same).
func checkSparseFlags(c *cli.Context) error {
	if _, _, err := sparseOptions(c); err != nil {
		return err
	}
	many := c.String("from") != "" || recursive(c)
	switch {
	case many && c.Bool("sparse"):
		return usagef("-S/--sparse applies to single-file copies for now, not to -r or --from (the source's holes stay holes there too)")
	case many && c.IsSet("zero"):
		return usagef("--zero applies to a single block device DEST (--force), not to -r or --from")
	}
	return nil
}
