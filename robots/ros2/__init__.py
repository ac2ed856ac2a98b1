"""Robots on ROS 2: the driver (:mod:`robots.ros2.driver`, the edge agent's
``driver: robots.ros2.driver:ros2_robot``), its config (:mod:`robots.ros2.config`) and the
digital twin, our MuJoCo arm as a ROS 2 node (:mod:`robots.ros2.twin`, ``robo-pipe twin``).

rclpy is an optional extra (``pip install 'robo-pipe[ros]'``): only :mod:`robots.ros2.node`,
the driver and the twin import it, and where it is missing they raise
:class:`robots.ros2.node.Ros2Unavailable`, which names the fix. The config module does not.
"""
