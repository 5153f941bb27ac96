package main

import (
	"github.com/rdmacp/rdmacp/initiator/local"
	"github.com/urfave/cli/v2"
)

// archiveFlags are rsync's -a and its parts, for cp.
func archiveFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "archive", Aliases: []string{"a"}, Usage: "-rlptgoD as rsync: a tree with permissions (setuid, setgid, sticky too), owners, groups and symlink mtimes; special files are still skipped"},
		&cli.BoolFlag{Name: "links", Aliases: []string{"l"}, Usage: "copy symlinks as symlinks (always so: accepted for rsync's -rlptgoD)"},
		&cli.BoolFlag{Name: "perms", Aliases: []string{"p"}, Usage: "keep setuid, setgid and sticky too (without it: mode & 0777)"},
		&cli.BoolFlag{Name: "times", Aliases: []string{"t"}, Usage: "keep symlinks' mtimes too (files' and directories' are always kept)"},
		&cli.BoolFlag{Name: "owner", Aliases: []string{"o"}, Usage: "keep owners, by name (as root; ignored with a warning otherwise)"},
		&cli.BoolFlag{Name: "group", Aliases: []string{"g"}, Usage: "keep groups, by name (as root; otherwise only groups you are in)"},
		&cli.BoolFlag{Name: "devices", Aliases: []string{"D"}, Usage: "accepted for rsync's -D: device files, FIFOs and sockets are still skipped, with a warning"},
		&cli.BoolFlag{Name: "numeric-ids", Usage: "with -o/-g, keep owner and group ids as numbers instead of mapping them by name"},
		&cli.BoolFlag{Name: "hard-links", Aliases: []string{"H"}, Usage: "files of a tree that are hard links of each other on the target land as hard links"},
		&cli.BoolFlag{Name: "xattrs", Aliases: []string{"X"}, Usage: "keep extended attributes: user.*, and trusted.* and security.* as root"},
		&cli.BoolFlag{Name: "acls", Aliases: []string{"A"}, Usage: "keep POSIX ACLs (implies -p); ids in ACL entries are kept as numbers"},
	}
}

// archiveOptions is what the archive flags of c ask a copy to keep.
func archiveOptions(c *cli.Context) local.Archive {
	a := c.Bool("archive")
	return local.Archive{
		Perms:      a || c.Bool("perms") || c.Bool("acls"),
		Owner:      a || c.Bool("owner"),
		Group:      a || c.Bool("group"),
		NumericIDs: c.Bool("numeric-ids"),
		Times:      a || c.Bool("times"),
		HardLinks:  c.Bool("hard-links"),
		Xattrs:     c.Bool("xattrs"),
		ACLs:       c.Bool("acls"),
	}
}

// recursive reports whether c copies trees: -r, or -a, which implies it.
func recursive(c *cli.Context) bool { return c.Bool("recursive") || c.Bool("archive") }
