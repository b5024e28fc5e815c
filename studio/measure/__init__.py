"""measure: timing (step counting that survives torch.compile) and quality (PSNR, SSIM); imports only spec."""
