package hostproxy

// Routes are the router's routes, as "METHOD /path" with echo's
// parameters (":id", "*"): what the tests compare with openapi.json.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.router.Routes() {
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

// HeapWatch and GuestHeapBound are heapWatch and guestHeapBound, for the
// tests of hostile guests outside the package.
var HeapWatch = heapWatch

const GuestHeapBound = guestHeapBound
