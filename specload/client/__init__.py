"""The hot path to the server: the HTTP/1.1 client (geventhttpclient's pool, our own response reader),
the stream reader that turns a response into one record, the server APIs (``backends``), and the
questions asked of the server outside the load (``probe``, ``introspect``).

Layer 1: imports only ``specload.core``. With ``specload.sim`` and ``specload.locust``, the only
package that may use gevent.
"""
