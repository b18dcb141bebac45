"""Looking at results: reports over a sweep's runs, and the speed/memory benchmarks."""
