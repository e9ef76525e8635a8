"""crossbar's server side: twisted.web made fit for a proxy, the pure rules of a
proxied request, and the exchange that forwards one and streams its answer back."""
