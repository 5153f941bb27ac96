package tree

import (
	"bufio"
	"encoding/gob"
	"io"
	"os"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// largeQueue holds, in order, the files a tree's walk leaves to be copied
// on their own after it: the first largeInMemory in memory, the rest
// spilled to an unlinked temporary file, so that a tree of millions of
// large files costs no more memory than one of a few thousand.
type largeQueue struct {
	mem     []initiator.Item
	f       *os.File // the spill, once needed
	w       *bufio.Writer
	enc     *gob.Encoder
	spilled int
}

// largeInMemory is how many files the queue keeps in memory (a few
// hundred bytes each) before it spills to disk.
var largeInMemory = 4096

// spilledItem is an item as the spill file has it.
type spilledItem struct {
	Rel   string
	Entry protocol.Entry
}

// add queues it; where the spill cannot be written, it stays in memory.
func (q *largeQueue) add(it initiator.Item) {
	if len(q.mem) < largeInMemory || !q.spill() {
		q.mem = append(q.mem, it)
		return
	}
	if q.enc.Encode(spilledItem{Rel: it.Rel, Entry: it.Entry}) != nil {
		q.mem = append(q.mem, it)
		return
	}
	q.spilled++
}

// spill opens the spill file if it is not open yet, and reports whether
// it is.
func (q *largeQueue) spill() bool {
	if q.f != nil {
		return true
	}
	f, err := os.CreateTemp("", "rdmacp-large-*")
	if err != nil {
		return false
	}
	os.Remove(f.Name()) // unlinked: gone with the process, whatever happens
	q.f, q.w = f, bufio.NewWriterSize(f, 64<<10)
	q.enc = gob.NewEncoder(q.w)
	return true
}

func (q *largeQueue) len() int { return len(q.mem) + q.spilled }

// each hands fn the queued files in the order they came, and empties the
// queue.
func (q *largeQueue) each(fn func(initiator.Item) error) error {
	defer q.close()
	mem := q.mem
	q.mem = nil
	for _, it := range mem {
		if err := fn(it); err != nil {
			return err
		}
	}
	if q.f == nil {
		return nil
	}
	if err := q.w.Flush(); err != nil {
		return err
	}
	if _, err := q.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	dec := gob.NewDecoder(bufio.NewReaderSize(q.f, 64<<10))
	for range q.spilled {
		var s spilledItem
		if err := dec.Decode(&s); err != nil {
			return err
		}
		if err := fn(initiator.Item{Rel: s.Rel, Entry: s.Entry}); err != nil {
			return err
		}
	}
	return nil
}

func (q *largeQueue) close() {
	if q.f != nil {
		q.f.Close()
		q.f, q.w, q.enc, q.spilled = nil, nil, nil, 0
	}
	q.mem = nil
}
