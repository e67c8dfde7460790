package manifesttest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// AdaptedReport is what CheckAdapted found in one HTTP server of Caddy's JSON
// config.
type AdaptedReport struct {
	Server   string
	Listen   []string
	Proxies  int
	Served   []string // the paths that reach an engine, sorted
	Problems []error
}

// CheckAdapted applies the route check of CheckRoutes to Caddy's own
// translation of a Caddyfile (the output of `caddy adapt`), so the rules hold
// for what Caddy runs, not only for what ParseCaddyfile understood: every
// reverse_proxy handler is reached only through routes whose matcher sets
// each carry a path matcher of InferencePaths only, and rewrites no path;
// no rewrite handler shares a server with it; and the server answers an
// unmatched request from a static 404.
func CheckAdapted(config []byte) ([]AdaptedReport, error) {
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
					Routes []route  `json:"routes"`
					Errors *struct {
						Routes []route `json:"routes"`
					} `json:"errors"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(config, &cfg); err != nil {
		return nil, fmt.Errorf("caddy's JSON config: %w", err)
	}
	names := make([]string, 0, len(cfg.Apps.HTTP.Servers))
	for name := range cfg.Apps.HTTP.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	var reports []AdaptedReport
	for _, name := range names {
		srv := cfg.Apps.HTTP.Servers[name]
		c := &adaptedCheck{served: map[string]bool{}}
		if err := c.walk(srv.Routes, nil, true); err != nil {
			return nil, fmt.Errorf("server %s: %w", name, err)
		}
		if srv.Errors != nil {
			if err := c.walk(srv.Errors.Routes, nil, false); err != nil {
				return nil, fmt.Errorf("server %s errors: %w", name, err)
			}
		}
		if c.proxies > 0 {
			if c.rewrites > 0 {
				c.problemf("rewrites the request path in a server that proxies to engines")
			}
			if !c.catchAll {
				c.problemf("no unmatched route answers 404: a request for any other path is not answered by Caddy itself")
			}
			for _, p := range RequiredPaths {
				if !c.served[p] {
					c.problemf("%s does not reach the engines", p)
				}
			}
		}
		served := make([]string, 0, len(c.served))
		for p := range c.served {
			served = append(served, p)
		}
		slices.Sort(served)
		reports = append(reports, AdaptedReport{Server: name, Listen: srv.Listen, Proxies: c.proxies, Served: served, Problems: c.problems})
	}
	return reports, nil
}

// route is one route of Caddy's HTTP app: matcher sets (ORed; the matchers
// of a set ANDed) and handlers, which are decoded by kind as they are met.
type route struct {
	Match  []map[string]json.RawMessage `json:"match"`
	Handle []json.RawMessage            `json:"handle"`
}

type adaptedCheck struct {
	served   map[string]bool
	proxies  int
	rewrites int
	catchAll bool
	problems []error
}

func (c *adaptedCheck) problemf(format string, args ...any) {
	c.problems = append(c.problems, fmt.Errorf(format, args...))
}

// walk checks routes that only requests for the paths in scope reach (nil:
// any path); unmatched is whether no matcher stands between them and the
// server.
func (c *adaptedCheck) walk(routes []route, scope map[string]bool, unmatched bool) error {
	for _, r := range routes {
		s, err := narrowSets(scope, r.Match)
		if err != nil {
			return err
		}
		open := unmatched && len(r.Match) == 0
		for _, raw := range r.Handle {
			var h struct {
				Handler    string          `json:"handler"`
				Routes     []route         `json:"routes"`
				Rewrite    json.RawMessage `json:"rewrite"`
				StatusCode json.RawMessage `json:"status_code"`
			}
			if err := json.Unmarshal(raw, &h); err != nil {
				return fmt.Errorf("handler: %w", err)
			}
			switch h.Handler {
			case "reverse_proxy":
				c.proxies++
				if s == nil {
					c.problemf("a reverse_proxy handler is reached by every path (the engines' /metrics, /tokenize, /reset_prefix_cache ...)")
				}
				for p := range s {
					c.served[p] = true
				}
				if len(h.Rewrite) > 0 {
					c.problemf("a reverse_proxy handler rewrites the request it sends to the engines")
				}
			case "rewrite":
				c.rewrites++
			case "static_response":
				if open && strings.Trim(string(h.StatusCode), `"`) == "404" {
					c.catchAll = true
				}
			case "subroute":
				if err := c.walk(h.Routes, s, open); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// narrowSets applies a route's matcher sets to scope: a route narrows it
// only if every set (they are ORed) has a path matcher listing inference
// paths only.
func narrowSets(scope map[string]bool, sets []map[string]json.RawMessage) (map[string]bool, error) {
	if len(sets) == 0 {
		return scope, nil
	}
	var paths []string
	for _, set := range sets {
		raw, ok := set["path"]
		if !ok {
			return scope, nil
		}
		var ps []string
		if err := json.Unmarshal(raw, &ps); err != nil {
			return nil, fmt.Errorf("path matcher: %w", err)
		}
		if len(ps) == 0 || !allInference(ps) {
			return scope, nil
		}
		paths = append(paths, ps...)
	}
	narrowed := map[string]bool{}
	for _, p := range paths {
		if scope == nil || scope[p] {
			narrowed[p] = true
		}
	}
	return narrowed, nil
}
