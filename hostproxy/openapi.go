package hostproxy

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"

	"strata/internal/jsend"
)

// OpenAPI is the OpenAPI 3.1 document of every public route, served at
// GET /v1/openapi.json (no key needed). The hostproxy tests hold it to
// the router (every route in it, nothing else) and to every request and
// answer they make, the integration tests to the Go client's exchanges
// with a real guest (internal/openapicheck); make test lints it with
// Redocly (redocly.yaml).
//
//go:embed openapi.json
var OpenAPI []byte

func (s *Server) openapi(c echo.Context) error {
	if err := jsend.RejectQueryAndBody(c.Request()); err != nil {
		return err
	}
	c.Response().Header().Set("Content-Type", "application/json")
	c.Response().WriteHeader(http.StatusOK)
	_, err := c.Response().Write(OpenAPI)
	return err
}
