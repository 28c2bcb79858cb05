"""The run layer: a request, its run and race, traces and the leaderboard."""
