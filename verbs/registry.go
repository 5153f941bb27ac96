package verbs

import (
	"fmt"
	"sort"
	"strings"
)

// Registry is an explicit set of providers. There is no global one: the
// program builds the registry it wants and passes it on.
type Registry struct {
	byName map[string]Provider
	order  []string
}

// NewRegistry returns a registry of ps, in order of preference.
func NewRegistry(ps ...Provider) *Registry {
	r := &Registry{byName: map[string]Provider{}}
	for _, p := range ps {
		r.Add(p)
	}
	return r
}

// Add appends p, replacing a provider of the same name.
func (r *Registry) Add(p Provider) {
	if _, dup := r.byName[p.Name()]; !dup {
		r.order = append(r.order, p.Name())
	}
	r.byName[p.Name()] = p
}

// Lookup returns the provider called name.
func (r *Registry) Lookup(name string) (Provider, error) {
	if p, ok := r.byName[name]; ok {
		return p, nil
	}
	known := append([]string(nil), r.order...)
	sort.Strings(known)
	return nil, fmt.Errorf("unknown transport %q (known: %s)", name, strings.Join(known, ", "))
}

// Names lists the providers in order of preference.
func (r *Registry) Names() []string { return append([]string(nil), r.order...) }

// Providers lists the providers in order of preference.
func (r *Registry) Providers() []Provider {
	ps := make([]Provider, len(r.order))
	for i, n := range r.order {
		ps[i] = r.byName[n]
	}
	return ps
}
