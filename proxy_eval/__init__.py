"""proxy_eval: proxy slices, proxy runs, capability profiles, PCA and mixture suggestions."""
