"""Datasets: registration and upload, validation per format (streamed), statistics, the mask
preview."""
