"""The dashboard's pages, one module per group: each holds the frame (``dashboard.frame``) and
declares its routes, which ``dashboard.routes`` gathers."""
