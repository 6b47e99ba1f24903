package rlsconformance

import (
	"fmt"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
)

type yDesc struct {
	Key         string  `yaml:"key"`
	Value       string  `yaml:"value"`
	RateLimit   *yLimit `yaml:"rate_limit"`
	Descriptors []yDesc `yaml:"descriptors"`
	ShadowMode  bool    `yaml:"shadow_mode"`
}

type yLimit struct {
	Unit            string `yaml:"unit"`
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
}

// XDS is a file of rules as the RateLimitConfig resource named name that
// Envoy Gateway would serve (fields the resource has no room for are
// refused).
func XDS(name, rules string) (*rlsconfv3.RateLimitConfig, error) {
	var root struct {
		Domain      string  `yaml:"domain"`
		Descriptors []yDesc `yaml:"descriptors"`
	}
	dec := yaml.NewDecoder(strings.NewReader(rules))
	dec.KnownFields(true)
	if err := dec.Decode(&root); err != nil {
		return nil, err
	}
	ds, err := xdsDescriptors(root.Descriptors)
	if err != nil {
		return nil, err
	}
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: root.Domain, Descriptors: ds}, nil
}

func xdsDescriptors(in []yDesc) ([]*rlsconfv3.RateLimitDescriptor, error) {
	var out []*rlsconfv3.RateLimitDescriptor
	for _, d := range in {
		pd := &rlsconfv3.RateLimitDescriptor{Key: d.Key, Value: d.Value, ShadowMode: d.ShadowMode}
		if l := d.RateLimit; l != nil {
			p := &rlsconfv3.RateLimitPolicy{RequestsPerUnit: l.RequestsPerUnit, Unlimited: l.Unlimited, Name: l.Name}
			if l.Unit != "" {
				u, ok := rlsconfv3.RateLimitUnit_value[strings.ToUpper(l.Unit)]
				if !ok {
					return nil, fmt.Errorf("unit %q", l.Unit)
				}
				p.Unit = rlsconfv3.RateLimitUnit(u)
			}
			for _, r := range l.Replaces {
				p.Replaces = append(p.Replaces, &rlsconfv3.RateLimitReplace{Name: r.Name})
			}
			pd.RateLimit = p
		}
		var err error
		if pd.Descriptors, err = xdsDescriptors(d.Descriptors); err != nil {
			return nil, err
		}
		out = append(out, pd)
	}
	return out, nil
}
