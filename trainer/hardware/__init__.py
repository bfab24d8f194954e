"""Real hardware over the network: arms behind SERL robot servers and cameras behind
URLs. Nothing here knows of envs or the console; trainer.envs.real_robot builds on it."""
