"""tpu-top: the live view of monitor reports in a terminal.

model.py  rows and view state (sorting, selection, pause, help), pure logic
drawing.py  styled segments and lines, bars, graphs, column layout: what every panel draws with
frame.py  one frame as lines of styled text, for any width and height
jobview.py, fleet_panel.py  the job screen and the fleet panel, drawn into the frame
screen.py the curses loop: keys, resizes, refresh, terminal restored on exit
"""
