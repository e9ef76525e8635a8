"""crossbar's own pages under ``/_crossbar/``: a thin Klein app over the health
table, with HTML for people and JSON and Prometheus metrics for machines."""
