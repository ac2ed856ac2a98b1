"""Robot data from outside the simulator into the pipeline's datasets: rosbags
(:mod:`stages.ingest.rosbag`, ``robo-pipe import rosbag``), read with ``rosbags`` and no ROS
install, every feature sampled as of its frame's time (:mod:`stages.ingest.align`)."""
