"""tpu-top: the live view of monitor reports in a terminal.

model.py  rows and view state (sorting, selection, pause, help), pure logic
frame.py  one frame as lines of styled text, for any width and height
screen.py the curses loop: keys, resizes, refresh, terminal restored on exit
"""
