"""measure: timing (a clock, step counting that survives torch.compile) and quality (PSNR, SSIM, the error map and
the worst tile, verdicts).

Imports only `spec` from the studio.
"""
