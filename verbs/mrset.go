package verbs

import (
	"errors"
	"fmt"
)

// MRSet is one buffer registered in several protection domains, one
// per device: a QP of device i names MR(i)'s keys. As an MR it is the
// first registration. Each registration pins the buffer's pages for its
// device; the pages are the same ones, not copies.
type MRSet struct {
	MR
	mrs   []MR
	lkeys []uint32
}

// RegMRs registers buf in each of pds, in order; on error none stays
// registered.
func RegMRs(pds []PD, buf []byte, access Access) (*MRSet, error) {
	if len(pds) == 0 {
		return nil, fmt.Errorf("register: no protection domain: %w", ErrInvalid)
	}
	s := &MRSet{}
	for i, pd := range pds {
		mr, err := pd.RegMR(buf, access)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("register in protection domain %d: %w", i, err)
		}
		s.mrs = append(s.mrs, mr)
		s.lkeys = append(s.lkeys, mr.LKey())
	}
	s.MR = s.mrs[0]
	return s, nil
}

// Count is how many protection domains hold the buffer.
func (s *MRSet) Count() int { return len(s.mrs) }

// At is the registration in the i-th protection domain.
func (s *MRSet) At(i int) MR { return s.mrs[i] }

// LKeys are the local keys, by protection domain. The caller must not
// change them.
func (s *MRSet) LKeys() []uint32 { return s.lkeys }

// Close deregisters the buffer everywhere.
func (s *MRSet) Close() error {
	var errs []error
	for _, mr := range s.mrs {
		errs = append(errs, mr.Close())
	}
	s.mrs = nil
	return errors.Join(errs...)
}
