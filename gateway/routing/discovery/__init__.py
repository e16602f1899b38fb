"""Where backends come from: a static list, DNS A records, or Kubernetes EndpointSlices."""
