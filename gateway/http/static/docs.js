// GET /docs: Swagger UI over this gateway's /openapi.json for the key typed in the bar. As
// QueryAPIGate's page does it: the page itself is public, the key is kept for this browser tab
// only (sessionStorage) and sent as X-API-Key with the document's request and with "Try it out"
// calls. Never in the URL: a query string lands in access logs, the history and Referer headers.
(function () {
  'use strict';
  var STORE = 'gateway-docs-key';
  var key = '';
  try { key = sessionStorage.getItem(STORE) || ''; } catch (e) { /* storage off: type it again */ }
  var input = document.getElementById('key');
  input.value = key;
  document.getElementById('key-form').addEventListener('submit', function (event) {
    event.preventDefault();
    try {
      if (input.value) { sessionStorage.setItem(STORE, input.value); } else { sessionStorage.removeItem(STORE); }
    } catch (e) { /* storage off */ }
    location.reload();
  });
  window.ui = SwaggerUIBundle({
    url: 'openapi.json', dom_id: '#ui', validatorUrl: null,
    requestInterceptor: function (req) { if (key) { req.headers['X-API-Key'] = key; } return req; }
  });
})();
