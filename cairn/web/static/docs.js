// The API's reference page (/docs): Swagger UI over this server's own document, as
// FastAPI's page starts it, from a file: the pages' Content-Security-Policy runs no
// inline script.
"use strict";

if (window.SwaggerUIBundle) {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
}
